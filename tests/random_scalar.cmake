# The RNG tests again with SIMD capped off, so the portable Box-Muller is checked against torch
# too (the default run takes the AVX2 kernel on any AVX2 machine).
add_test(NAME random_portable_kernels COMMAND tessera_tests --gtest_filter=Random.*)
set_tests_properties(random_portable_kernels PROPERTIES ENVIRONMENT TESSERA_CPU_ISA=scalar TIMEOUT 300)
