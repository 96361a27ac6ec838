# Offload again on the asynchronous stream and with regional compilation (block programs take
# the streamed weights as inputs): outputs must stay bit-identical to no offload.
add_test(NAME offload_async_eager COMMAND tessera_tests --gtest_filter=*Offload*)
set_tests_properties(offload_async_eager PROPERTIES ENVIRONMENT TESSERA_ASYNC_DISPATCH=1 TIMEOUT 900)
add_test(NAME offload_regional_compile COMMAND tessera_tests --gtest_filter=*Offload*)
set_tests_properties(offload_regional_compile PROPERTIES ENVIRONMENT TESSERA_COMPILE=regional
                     TIMEOUT 900)
# SD3's offload with deferred-and-fused execution and regional compilation together: the one
# JointTransformerBlock class (three variants) streamed block by block through block programs.
add_test(NAME offload_sd3_defer_regional COMMAND tessera_tests --gtest_filter=*SD3Offload*)
set_tests_properties(offload_sd3_defer_regional PROPERTIES
                     ENVIRONMENT "TESSERA_DEFER_AND_FUSE=1;TESSERA_COMPILE=regional" TIMEOUT 900)
