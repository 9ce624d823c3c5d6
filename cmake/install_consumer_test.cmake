# Installs hymix from BUILD_DIR into WORK_DIR/prefix; checks the installed documentation (every relative link of the
# installed README resolves under DOC_DIR) and that the exported target carries no -Werror / -march; then
# configures, builds and runs examples/consumer and the installed examples/compose_stack.cpp against the installed
# package with find_package(hymix CONFIG REQUIRED). Arguments (-D): SOURCE_DIR, BUILD_DIR, WORK_DIR, CXX
# (compiler), GENERATOR (optional), DOC_DIR (install-relative doc directory, default share/doc/hymix).
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "installing ${BUILD_DIR} into ${WORK_DIR}/prefix failed:\n${out}${err}")
endif()
foreach(f include/hymix/core/tensor.hpp include/hymix/kernels/linear.hpp share/cmake/hymix/hymixConfig.cmake
          share/cmake/hymix/hymixConfigVersion.cmake share/cmake/hymix/hymixTargets.cmake)
    if(NOT EXISTS ${WORK_DIR}/prefix/${f})
        message(FATAL_ERROR "the install is missing ${f}")
    endif()
endforeach()

# The README's relative links ([text](target)) must work from the install, as they do in the repository.
if(NOT DOC_DIR)
    set(DOC_DIR share/doc/hymix)
endif()
set(doc ${WORK_DIR}/prefix/${DOC_DIR})
foreach(f README.md LICENSE docs/spec.md docs/architecture.md examples/compose_stack.cpp examples/consumer/CMakeLists.txt)
    if(NOT EXISTS ${doc}/${f})
        message(FATAL_ERROR "the install is missing ${DOC_DIR}/${f}")
    endif()
endforeach()
file(READ ${doc}/README.md readme)
# "](" becomes a marker first: square brackets inside list elements would break CMake's list splitting.
string(REPLACE "](" "@LINK@" readme "${readme}")
string(REGEX MATCHALL "@LINK@[^)#]+" links "${readme}")
set(n_links 0)
foreach(link IN LISTS links)
    string(REPLACE "@LINK@" "" target "${link}")
    if(target MATCHES "^[a-z]+:")  # http:, https:, mailto:
        continue()
    endif()
    math(EXPR n_links "${n_links} + 1")
    if(NOT EXISTS ${doc}/${target})
        message(FATAL_ERROR "the installed README links to '${target}', which is not installed (${doc}/${target})")
    endif()
endforeach()
if(n_links EQUAL 0)
    message(FATAL_ERROR "found no relative links in the installed README: the link check is broken")
endif()
message(STATUS "the installed README's ${n_links} relative links resolve under ${DOC_DIR}")

# Warning and architecture flags are hymix's own business: nothing in the exported package may impose them.
file(GLOB exported ${WORK_DIR}/prefix/share/cmake/hymix/*.cmake)
foreach(f IN LISTS exported)
    file(READ ${f} text)
    if(text MATCHES "-Werror|-march|-Wall")
        message(FATAL_ERROR "${f} passes warning or architecture flags to consumers")
    endif()
endforeach()

set(gen_args "")
if(GENERATOR)
    set(gen_args -G ${GENERATOR})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/build ${gen_args}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
    -DHYMIX_CONSUMER_EXAMPLE=${doc}/examples/compose_stack.cpp
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer against the installed package failed:\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the consumer failed:\n${out}${err}")
endif()
foreach(exe hymix_consumer hymix_installed_example)
    execute_process(COMMAND ${WORK_DIR}/build/${exe} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    message(STATUS "${exe}: ${out}${err}")
    if(NOT rc EQUAL 0)
        message(FATAL_ERROR "${exe} ran but failed (exit ${rc})")
    endif()
endforeach()
