# Chat-template parity with HF transformers: every template in tests/data/chat_templates
# rendered over a conversation suite by `ringctl chat-template` and by transformers'
# apply_chat_template path (jinja2 3.1.6 in the venv); exact string equality, and errors
# where jinja2 raises. Needs .venv (jinja2; transformers preferred, a replica otherwise).
if(TARGET ringctl AND TARGET ring_text)
  if(EXISTS ${RING_VENV_PYTHON})
    add_test(NAME chat_template_parity
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/chat_template_parity.py
                     --ringctl $<TARGET_FILE:ringctl>
                     --templates ${CMAKE_CURRENT_SOURCE_DIR}/data/chat_templates)
    set_tests_properties(chat_template_parity PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                         LABELS "python;text")
  else()
    message(STATUS "RingServe: ${RING_VENV_PYTHON} missing; chat template parity test not registered")
  endif()
endif()
