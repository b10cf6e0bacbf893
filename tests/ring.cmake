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

# OpenAI API end to end: ring-server + 2 ring-workers on loopback, driven by the official
# `openai` client (tests/openai_api_test.py).
if(TARGET ring-server AND TARGET ring-worker AND TARGET ringctl AND EXISTS ${RING_VENV_PYTHON})
  add_test(NAME openai_api
           COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/openai_api_test.py
                   --ringctl $<TARGET_FILE:ringctl> --worker $<TARGET_FILE:ring-worker>
                   --server $<TARGET_FILE:ring-server> --work ${CMAKE_CURRENT_BINARY_DIR}/openai_api)
  set_tests_properties(openai_api PROPERTIES TIMEOUT 400 LABELS "python;api")
endif()

# The closed ring (ring.topology = "closed"): 1-4 stages of two families generate what the
# in-process engine does (greedy and seeded sampling, logprobs), star = closed, and faults
# inside the ring (corrupt frame between workers, NaN, a stalled stage) name the stage.
if(TARGET ring-server AND TARGET ring-worker AND TARGET ringctl AND EXISTS ${RING_VENV_PYTHON})
  add_test(NAME closed_ring
           COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/closed_ring_test.py
                   --ringctl $<TARGET_FILE:ringctl> --worker $<TARGET_FILE:ring-worker>
                   --server $<TARGET_FILE:ring-server> --work ${CMAKE_CURRENT_BINARY_DIR}/closed_ring)
  set_tests_properties(closed_ring PROPERTIES TIMEOUT 400 LABELS "python;ring")
endif()

# Operations: worker metrics ports (promtool), ring_worker_up, ringctl status tokens/s,
# ringctl apply / rebalance (mid-stream, nothing fails), shell completion.
if(TARGET ring-server AND TARGET ring-worker AND TARGET ringctl AND EXISTS ${RING_VENV_PYTHON})
  add_test(NAME ops
           COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/ops_test.py
                   --ringctl $<TARGET_FILE:ringctl> --worker $<TARGET_FILE:ring-worker>
                   --server $<TARGET_FILE:ring-server> --work ${CMAKE_CURRENT_BINARY_DIR}/ops)
  set_tests_properties(ops PROPERTIES TIMEOUT 400 LABELS "python;ops")
endif()

# deploy/: promtool checks of the alert rules and scrape config, dashboard metric names,
# and the relocatable bundle run from another directory.
find_program(RING_PROMTOOL promtool)
find_program(RING_PATCHELF patchelf)
if(RING_PROMTOOL AND RING_PATCHELF AND TARGET ring-server AND TARGET ring-worker AND TARGET ringctl)
  add_test(NAME deploy_check
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/deploy_check.sh ${CMAKE_SOURCE_DIR}
                   $<TARGET_FILE:ringctl> $<TARGET_FILE:ring-worker> $<TARGET_FILE:ring-server>
                   ${CMAKE_CURRENT_BINARY_DIR}/deploy_check)
  set_tests_properties(deploy_check PROPERTIES TIMEOUT 300 LABELS "deploy")
endif()

# `ringctl verify` (precision guard): exit codes, report, --json, and the test-only fault
# switch named by the bisection. CPU device here; tests/gpu/gpu.cmake runs it on cuda:0.
if(TARGET ringctl)
  add_test(NAME verify_cli
           COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/verify_cli_test.sh $<TARGET_FILE:ringctl>
                   ${CMAKE_CURRENT_BINARY_DIR}/verify_cli cpu)
  set_tests_properties(verify_cli PROPERTIES TIMEOUT 300 LABELS "precision")
endif()
