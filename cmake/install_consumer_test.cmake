# Installs hymix from BUILD_DIR into WORK_DIR/prefix, then configures, builds and runs examples/consumer
# against the installed package with find_package(hymix CONFIG REQUIRED). Arguments (-D): SOURCE_DIR,
# BUILD_DIR, WORK_DIR, CXX (compiler), GENERATOR (optional).
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

set(gen_args "")
if(GENERATOR)
    set(gen_args -G ${GENERATOR})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/consumer -B ${WORK_DIR}/build ${gen_args}
    -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "configuring the consumer against the installed package failed:\n${err}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building the consumer failed:\n${out}${err}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/hymix_consumer RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "${out}${err}")
if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the consumer ran but failed (exit ${rc})")
endif()
