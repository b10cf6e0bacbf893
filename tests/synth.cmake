# Tests of `ringctl synth` that need the Python oracles in .venv (HF tokenizers, jinja2,
# transformers, mlx-lm): the tokenizer/chat template check and the structural parity with
# checkpoints mlx-lm writes itself.
if(TARGET ringctl)
  if(EXISTS ${RING_VENV_PYTHON})
    add_test(NAME synth_tokenizer_check
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/synth_tokenizer_check.py
                     --ringctl $<TARGET_FILE:ringctl>
                     --work ${CMAKE_CURRENT_BINARY_DIR}/synth_tokenizer_check)
    set_tests_properties(synth_tokenizer_check PROPERTIES TIMEOUT 300 LABELS "python;synth")
    add_test(NAME synth_vs_mlx
             COMMAND ${RING_VENV_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/synth_vs_mlx.py
                     --ringctl $<TARGET_FILE:ringctl>
                     --work ${CMAKE_CURRENT_BINARY_DIR}/synth_vs_mlx)
    set_tests_properties(synth_vs_mlx PROPERTIES TIMEOUT 600 LABELS "python;synth")
  else()
    message(STATUS "RingServe: ${RING_VENV_PYTHON} missing; synth Python tests not registered "
                   "(run deploy/install_deps.sh)")
  endif()
endif()
