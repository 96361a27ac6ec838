# tessera serve's page in headless Chromium (Debian's chromium; skipped when it is absent).
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND)
  add_test(NAME serve_page_chromium
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/serve_page_test.py
                   $<TARGET_FILE:tessera>)
  set_tests_properties(serve_page_chromium PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 180
                       ENVIRONMENT TESSERA_PJRT_PLUGIN=none)
endif()
