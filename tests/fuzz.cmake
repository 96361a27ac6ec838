# Builds and runs the libFuzzer target for the safetensors header parser with clang, apart from
# the main build (tests/fuzz/run_fuzz.sh); TESSERA_FUZZ_SECONDS sets the budget (default 30).
add_test(NAME fuzz_safetensors_header
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run_fuzz.sh ${PROJECT_SOURCE_DIR}
                 ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(fuzz_safetensors_header PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 900
                     LABELS fuzz)
