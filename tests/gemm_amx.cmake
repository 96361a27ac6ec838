# The GEMM tests again with the ISA capped below AMX, so bf16 linear/matmul run on oneDNN (the
# default run takes the AMX kernel on an AMX machine; docs/decisions/0002-gemm-library.md).
add_test(NAME gemm_onednn_bf16 COMMAND tessera_tests --gtest_filter=Linalg*:GemmAmx*)
set_tests_properties(gemm_onednn_bf16 PROPERTIES ENVIRONMENT TESSERA_CPU_ISA=avx512_bf16 TIMEOUT 600)
