# Ring integration: ring-worker processes driven by `ringctl logits --workers`, checked bit
# for bit against the in-process engine, plus the failure paths (corrupt frame, killed or
# stalled worker, model paths escaping the root). Needs .venv (numpy).
if(TARGET ring-worker AND TARGET ringctl)
  if(EXISTS ${RING_VENV_PYTHON})
    add_test(NAME ring_integration
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ring_integration_test.py
                     --ringctl $<TARGET_FILE:ringctl> --worker $<TARGET_FILE:ring-worker>
                     --work ${CMAKE_CURRENT_BINARY_DIR}/ring_integration)
    set_tests_properties(ring_integration PROPERTIES TIMEOUT 300 LABELS "python;ring")
  else()
    message(STATUS "RingServe: ${RING_VENV_PYTHON} missing; ring integration test not registered")
  endif()
endif()
