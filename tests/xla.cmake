# The XLA backend's suites (decision 0030), when it is built: its own tests and the backend
# conformance suite with xla:cpu among the devices. Every other entry runs with
# TESSERA_PJRT_PLUGIN=none, so an installed plugin changes nothing there. Included last
# (alphabetical), it sees every add_test entry of this folder.
get_property(_tessera_tests DIRECTORY PROPERTY TESTS)
foreach(t ${_tessera_tests})
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT TESSERA_PJRT_PLUGIN=none)
endforeach()
if(PJRT_C_API_INCLUDE_DIR)
  add_test(NAME xla_backend COMMAND tessera_tests
           --gtest_filter=Xla*:-Xla.EveryConformanceFamilyIsLowered:XlaCache.*:XlaAot.*:XlaTpuAot.*:XlaSpmd.*)
  set_tests_properties(xla_backend PROPERTIES TIMEOUT 300)
  # SPMD tensor parallelism (decision 0060): one process driving 2 and 4 xla:cpu devices; the
  # plugin's device count is fixed when it starts, so these run in a process of their own.
  # One entry per model test so each stays short, and one for the rest (basics, the pipeline).
  add_test(NAME xla_spmd
           COMMAND tessera_tests --gtest_filter=XlaSpmd.*:-XlaSpmd.*MatchesOneDevice:XlaSpmd.*Generate*)
  set_tests_properties(xla_spmd PROPERTIES ENVIRONMENT TESSERA_XLA_CPU_DEVICES=4 TIMEOUT 300)
  foreach(_t FluxSchnellFixtureOnTwoDevices FluxDevFixtureOnTwoDevices FluxWithFourHeadsOnTwoDevices
          FluxWithFourHeadsOnFourDevices GenerateWithTpOnXlaCpuWritesThePictureOfOneDevice
          Sd3AndFlux2GenerateWithTpOnXlaCpuWriteThePictureOfOneDevice)
    add_test(NAME xla_spmd_${_t} COMMAND tessera_tests --gtest_filter=XlaSpmd.${_t}*)
    # 30-45 s each in Release on 2 cores; the margin is for ASan and loaded machines.
    set_tests_properties(xla_spmd_${_t} PROPERTIES ENVIRONMENT TESSERA_XLA_CPU_DEVICES=4
                         TIMEOUT 900)
  endforeach()
  add_test(NAME xla_conformance
           COMMAND tessera_tests --gtest_filter=conformance/BackendConformance.*:Xla.EveryConformanceFamilyIsLowered)
  set_tests_properties(xla_conformance PROPERTIES TIMEOUT 600)
  # FLUX.1 pipeline goldens with every model and input on xla:cpu (pipe.to(device)): one case
  # per checkpoint in f32 and bf16 here (each new image size compiles its ops); all twelve pass
  # with --gtest_filter=*FluxPipelineGolden* and TESSERA_PIPELINE_DEVICE=xla:cpu.
  add_test(NAME xla_flux_pipeline
           COMMAND tessera_tests --gtest_filter=*FluxPipelineGolden*tiny_cat_*)
  set_tests_properties(xla_flux_pipeline PROPERTIES ENVIRONMENT TESSERA_PIPELINE_DEVICE=xla:cpu
                       TIMEOUT 600)
  # The same goldens in the other modes on xla:cpu: deferred (one executable per segment),
  # compiled (the transformer's program as one executable) and regional (one executable per
  # block class, weights as inputs); the f32 and bf16 cases of both tiny checkpoints.
  foreach(_mode defer compile regional)
    if(_mode STREQUAL "defer")
      set(_env TESSERA_DEFER_AND_FUSE=1)
    elseif(_mode STREQUAL "compile")
      set(_env TESSERA_COMPILE=full)
    else()
      set(_env TESSERA_COMPILE=regional)
    endif()
    add_test(NAME xla_flux_pipeline_${_mode}
             COMMAND tessera_tests --gtest_filter=*FluxPipelineGolden*tiny_cat_*)
    set_tests_properties(xla_flux_pipeline_${_mode} PROPERTIES
                         ENVIRONMENT "TESSERA_PIPELINE_DEVICE=xla:cpu;${_env}" TIMEOUT 900)
  endforeach()
  # SD3.5 and FLUX.2 pipeline goldens on xla:cpu, strict eager and compiled (f32 and bf16 of each
  # fixture case; the text encoders run op by op in both). 2 min each in Release, 7-8 under ASan.
  add_test(NAME xla_sd3_flux2_pipeline
           COMMAND tessera_tests --gtest_filter=*SD3PipelineGolden*:*Flux2PipelineGolden*)
  set_tests_properties(xla_sd3_flux2_pipeline PROPERTIES ENVIRONMENT TESSERA_PIPELINE_DEVICE=xla:cpu
                       TIMEOUT 1800)
  add_test(NAME xla_sd3_flux2_pipeline_compile
           COMMAND tessera_tests --gtest_filter=*SD3PipelineGolden*:*Flux2PipelineGolden*)
  set_tests_properties(xla_sd3_flux2_pipeline_compile PROPERTIES
                       ENVIRONMENT "TESSERA_PIPELINE_DEVICE=xla:cpu;TESSERA_COMPILE=full" TIMEOUT 1800)
  # Model and sequential offload onto xla:cpu from the CLI (weights uploaded per stage or per
  # block): the image equals the one without offload (the *_same entries compare the files).
  add_test(NAME xla_cli_generate_eager
           COMMAND tessera generate --model ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/flux1-schnell-tiny
                   --prompt "a cat" --height 64 --width 64 --steps 2 --seed 0 --device xla:cpu
                   -o ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_eager.png)
  add_test(NAME xla_cli_generate_offload
           COMMAND tessera generate --model ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/flux1-schnell-tiny
                   --prompt "a cat" --height 64 --width 64 --steps 2 --seed 0 --device xla:cpu
                   --offload model -o ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_offload.png)
  add_test(NAME xla_cli_generate_sequential
           COMMAND tessera generate --model ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/flux1-schnell-tiny
                   --prompt "a cat" --height 64 --width 64 --steps 2 --seed 0 --device xla:cpu
                   --offload sequential -o ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_sequential.png)
  add_test(NAME xla_cli_generate_offload_same
           COMMAND ${CMAKE_COMMAND} -E compare_files
                   ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_eager.png
                   ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_offload.png)
  add_test(NAME xla_cli_generate_sequential_same
           COMMAND ${CMAKE_COMMAND} -E compare_files
                   ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_eager.png
                   ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate_sequential.png)
  set_tests_properties(xla_cli_generate_eager xla_cli_generate_offload xla_cli_generate_sequential
                       PROPERTIES TIMEOUT 300)
  set_tests_properties(xla_cli_generate_offload_same PROPERTIES
                       DEPENDS "xla_cli_generate_eager;xla_cli_generate_offload")
  set_tests_properties(xla_cli_generate_sequential_same PROPERTIES
                       DEPENDS "xla_cli_generate_eager;xla_cli_generate_sequential")
  # The CLI on xla:cpu, compiled mode (the transformer's program compiled for the xla backend).
  add_test(NAME xla_cli_generate
           COMMAND tessera generate --model ${CMAKE_CURRENT_SOURCE_DIR}/fixtures/flux1-schnell-tiny
                   --prompt "a cat" --height 64 --width 64 --steps 2 --seed 0 --device xla:cpu
                   --mode compile -o ${CMAKE_CURRENT_BINARY_DIR}/xla_cli_generate.png)
  set_tests_properties(xla_cli_generate PROPERTIES TIMEOUT 300)
  # Executables on disk (decision 0045) and tessera compile on xla:cpu (0046): CLI runs.
  add_test(NAME xla_executable_cache COMMAND tessera_tests --gtest_filter=XlaCache.*:XlaAot.*)
  set_tests_properties(xla_executable_cache PROPERTIES TIMEOUT 900)
  # TPU topologies compiled without a TPU: needs libtpu (TESSERA_LIBTPU=1 scripts/setup.sh);
  # skipped (77) without it.
  add_test(NAME xla_tpu_aot
           COMMAND sh -c "p=\${TESSERA_LIBTPU_PATH:-\$HOME/.cache/tessera/xla/libtpu/libtpu/libtpu.so}; [ -f \"\$p\" ] || exit 77; exec \"$0\" --gtest_filter=XlaTpuAot.*"
                   $<TARGET_FILE:tessera_tests>)
  set_tests_properties(xla_tpu_aot PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600)
endif()
