# The model tests again in deferred-and-fused mode: every fused segment must reproduce strict
# eager's results (tests/modes_test.cpp checks the op sequences bit for bit).
add_test(NAME models_defer_and_fuse
         COMMAND tessera_tests --gtest_filter=*FluxTransformer*:*CLIP*:*T5*:*AutoencoderKL*:*FluxPipeline*:*SD3*:Modes.*:Fusion.*:*Flux2*:*Mistral3*)
set_tests_properties(models_defer_and_fuse PROPERTIES ENVIRONMENT TESSERA_DEFER_AND_FUSE=1 TIMEOUT 900)
# Strict eager on the asynchronous stream (one worker thread), the same tests.
add_test(NAME models_async_eager
         COMMAND tessera_tests --gtest_filter=*FluxTransformer*:*CLIP*:*T5*:*AutoencoderKL*:*FluxPipeline*:*SD3*:Modes.*:Fusion.*:*Flux2*:*Mistral3*)
set_tests_properties(models_async_eager PROPERTIES ENVIRONMENT TESSERA_ASYNC_DISPATCH=1 TIMEOUT 900)
# The FLUX transformer and pipeline goldens in compiled mode (one program per input signature)
# and in regional mode (one program per block class, weights as inputs, also under offload);
# see decision 0010.
add_test(NAME models_compile_full
         COMMAND tessera_tests --gtest_filter=*FluxTransformer*:*FluxPipeline*:*SD3*:*Offload*:Modes.*:*Compile*:*Flux2*:*Mistral3*)
set_tests_properties(models_compile_full PROPERTIES ENVIRONMENT TESSERA_COMPILE=full TIMEOUT 900)
add_test(NAME models_compile_regional
         COMMAND tessera_tests --gtest_filter=*FluxTransformer*:*FluxPipeline*:*SD3*:*Offload*:Modes.*:*Compile*:*Flux2*:*Mistral3*)
set_tests_properties(models_compile_regional PROPERTIES ENVIRONMENT TESSERA_COMPILE=regional
                     TIMEOUT 900)
