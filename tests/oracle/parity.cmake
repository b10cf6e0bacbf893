# mlx-lm oracle parity (tests/oracle/README.md).
# oracle_fixtures: build the tiny random MLX checkpoints + recorded logits with mlx-lm
#                  (also proves each saved checkpoint reproduces its logits on reload).
# mlx_parity:      run the engine's `ringctl logits` on every fixture and compare.
# Needs RING_VENV_PYTHON (the pinned venv) and RING_FIXTURES, set in tests/CMakeLists.txt.
if(NOT EXISTS ${RING_VENV_PYTHON})
  message(WARNING "RingServe: ${RING_VENV_PYTHON} missing - oracle tests will fail (tests/requirements.txt)")
endif()

add_test(NAME oracle_fixtures
  COMMAND ${RING_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/make_fixtures.py ${RING_FIXTURES}/models)
set_tests_properties(oracle_fixtures PROPERTIES
  FIXTURES_SETUP oracle_models
  TIMEOUT 300
  LABELS "oracle")

if(TARGET ringctl)
  add_test(NAME mlx_parity
    COMMAND ${RING_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/check_parity.py
            --ringctl $<TARGET_FILE:ringctl>
            --fixtures ${RING_FIXTURES}/models
            --stages-check
            --report ${CMAKE_BINARY_DIR}/parity.md)
  set_tests_properties(mlx_parity PROPERTIES
    FIXTURES_REQUIRED oracle_models
    TIMEOUT 600
    LABELS "oracle;parity")
endif()

# Second oracle for GLM-5.x / GLM-5.2 IndexShare: HF transformers in fp32 against our engine
# in fp32 (NMSE <= 1e-6). Needs torch, which the CI venv does not have: the test then
# reports itself skipped (exit 77). It runs on the GPU machine, where torch is installed.
if(TARGET ringctl)
  foreach(fx glm52_indexshare_mxfp4 glm5_mxfp4_c7)
    add_test(NAME hf_oracle_${fx}
      COMMAND ${RING_VENV_PYTHON} ${CMAKE_SOURCE_DIR}/tests/oracle/hf_indexshare.py
              --fixture ${RING_FIXTURES}/models/${fx} --ringctl $<TARGET_FILE:ringctl>)
    set_tests_properties(hf_oracle_${fx} PROPERTIES
      FIXTURES_REQUIRED oracle_models SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "oracle")
  endforeach()
endif()
