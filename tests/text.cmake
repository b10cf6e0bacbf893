# Parity of the C++ tokenizer (server/tokenizer.h) with HF `tokenizers`, through
# `ringctl tokenize`: 10,000 strings per tokenizer file (ringctl synth's GLM and Qwen
# styles, BPEs trained by `tokenizers` itself, feature variants). Needs .venv (tokenizers).
if(TARGET ringctl AND TARGET ring_text)
  if(EXISTS ${RING_VENV_PYTHON})
    add_test(NAME tokenizer_parity
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tokenizer_parity.py
                     --ringctl $<TARGET_FILE:ringctl>
                     --work ${CMAKE_CURRENT_BINARY_DIR}/tokenizer_parity)
    set_tests_properties(tokenizer_parity PROPERTIES TIMEOUT 300 LABELS "python;text")
  else()
    message(STATUS "RingServe: ${RING_VENV_PYTHON} missing; tokenizer parity test not registered")
  endif()
endif()
