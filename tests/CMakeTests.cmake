# Oracle-backed tests (included by tests/CMakeLists.txt, which sets RING_VENV_PYTHON and
# RING_FIXTURES). Each fixture generator is a FIXTURES_SETUP test, so `ctest -R <consumer>`
# regenerates what it needs first.

# Quantization parity with MLX (kernels/quant_mlx_test.cc): mx.quantize / dequantize /
# quantized_matmul / gather_qmm on MLX's CPU device, written by tests/oracle/quant_fixtures.py.
if(TARGET kernels_test)
  if(EXISTS ${RING_VENV_PYTHON})
    add_test(NAME kernels_quant_fixtures
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/oracle/quant_fixtures.py
                     ${RING_FIXTURES}/quant)
    set_tests_properties(kernels_quant_fixtures PROPERTIES FIXTURES_SETUP quant_fixtures
                         TIMEOUT 120 LABELS oracle)
    add_test(NAME kernels_quant_mlx_parity
             COMMAND kernels_test --gtest_filter=QuantMlx.*)
    set_tests_properties(kernels_quant_mlx_parity PROPERTIES
                         FIXTURES_REQUIRED quant_fixtures
                         ENVIRONMENT RING_QUANT_FIXTURES=${RING_FIXTURES}/quant
                         SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
                         TIMEOUT 300 LABELS oracle)
  else()
    message(STATUS "RingServe: no ${RING_VENV_PYTHON}; MLX quantization parity test disabled")
  endif()
endif()
