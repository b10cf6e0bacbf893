# Whole-model GPU parity (tests/gpu/gpu_parity.py): `ringctl logits --backend cuda` against
# `--backend cpu` on every mlx-lm oracle fixture, NMSE <= 1e-3 at every position, GPU stage
# splits bit-identical. Label gpu; exits 77 (skipped) without a CUDA device or without the
# CUDA backend in this build. Runs on the H200 from a bundle: see docs/correctness.md §3.
if(TARGET ringctl AND EXISTS ${RING_VENV_PYTHON})
  add_test(NAME gpu_model_parity
    COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/gpu_parity.py
            --ringctl $<TARGET_FILE:ringctl>
            --fixtures ${RING_FIXTURES}/models
            --report ${CMAKE_BINARY_DIR}/gpu_parity.md)
  set_tests_properties(gpu_model_parity PROPERTIES
    FIXTURES_REQUIRED oracle_models SKIP_RETURN_CODE 77 TIMEOUT 900 LABELS "gpu")
endif()

# `ringctl verify --device cuda:0`: a correct GPU passes, the fault switch is named.
if(TARGET ringctl)
  add_test(NAME gpu_verify
           COMMAND bash ${CMAKE_SOURCE_DIR}/tests/verify_cli_test.sh $<TARGET_FILE:ringctl>
                   ${CMAKE_BINARY_DIR}/gpu_verify cuda:0)
  set_tests_properties(gpu_verify PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600 LABELS "gpu")
endif()

# The GLM slice trace report's idle attribution (bench/gpu/glm_trace_report.py), on
# hand-made traces: runs without a GPU.
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  add_test(NAME glm_trace_report
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/gpu/glm_trace_report_test.py)
  set_tests_properties(glm_trace_report PROPERTIES TIMEOUT 60 LABELS "python")
  # The ring stages' trace report (bench/gpu/ring_trace_report.py), likewise.
  add_test(NAME ring_trace_report
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/gpu/ring_trace_report_test.py)
  set_tests_properties(ring_trace_report PROPERTIES TIMEOUT 60 LABELS "python")
  # The Nsight Compute stall report (bench/gpu/ncu_stall_report.py), on hand-made output.
  add_test(NAME ncu_stall_report
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_SOURCE_DIR}/bench/gpu/ncu_stall_report_test.py)
  set_tests_properties(ncu_stall_report PROPERTIES TIMEOUT 60 LABELS "python")
endif()
