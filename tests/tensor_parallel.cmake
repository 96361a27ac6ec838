# Tensor parallelism under mpirun (decision 0040): the TensorParallelMpi tests on 2 and 4 ranks,
# oversubscribed (CI machines may have 2 cores; mpirun refuses root without --allow-run-as-root).
# Without MPI the entries are skipped (exit code 77).
if(MPI_C_FOUND)
  foreach(n 2 4)
    add_test(NAME tensor_parallel_mpi_${n}
             COMMAND ${MPIEXEC_EXECUTABLE} --allow-run-as-root --oversubscribe --bind-to none -n ${n}
                     $<TARGET_FILE:tessera_tests> --gtest_filter=TensorParallelMpi.*)
    set_tests_properties(tensor_parallel_mpi_${n} PROPERTIES TIMEOUT 600
                         ENVIRONMENT "TESSERA_PJRT_PLUGIN=none;TESSERA_NUM_THREADS=1")
  endforeach()
else()
  add_test(NAME tensor_parallel_mpi_2 COMMAND sh -c "echo 'built without MPI: skipped'; exit 77")
  set_tests_properties(tensor_parallel_mpi_2 PROPERTIES SKIP_RETURN_CODE 77)
endif()
