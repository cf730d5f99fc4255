# ctest's test_install: installs the built library into a scratch prefix, builds and runs
# a user's project against it with find_package(mumoe), and configures a project that
# uses add_subdirectory(mumoe). Run as
#   cmake -DMUMOE_SOURCE_DIR=... -DMUMOE_BUILD_DIR=... -DWORK_DIR=... -DCXX=... -P check_install.cmake
foreach(v MUMOE_SOURCE_DIR MUMOE_BUILD_DIR WORK_DIR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "check_install.cmake: -D${v}=... is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

# With -DBUILD_FETCHCONTENT=ON (the slow test_fetchcontent_build): only build and run the
# FetchContent project, which compiles the whole library as part of a user's build (with
# the default options, the same compile commands as this build's, so ccache serves most).
# Configures, builds and runs the user's project tests/install/<form> (its program is
# named <program>) in WORK_DIR/<dir>, with the extra configure arguments given.
function(build_and_run form dir program)
  set(user ${WORK_DIR}/${dir})
  run("configuring the ${form} project" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${form} -B ${user}
      -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release ${ARGN})
  run("building the ${form} project" ${CMAKE_COMMAND} --build ${user} -j2)
  run("running the ${form} project" ${user}/${program})
  if(NOT last_output MATCHES "uses_mumoe: ok")
    message(FATAL_ERROR "${program} printed: ${last_output}")
  endif()
endfunction()

if(BUILD_FETCHCONTENT)
  build_and_run(fetchcontent fetchcontent_build fetches_mumoe -DMUMOE_SOURCE_DIR=${MUMOE_SOURCE_DIR})
  message(STATUS "FetchContent(mumoe): built and ran a program")
  return()
endif()

run("cmake --install" ${CMAKE_COMMAND} --install ${MUMOE_BUILD_DIR} --prefix ${prefix})
foreach(f include/mumoe/mumoe.h include/mumoe/tensor/tensor.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "the install did not put ${f} in place")
  endif()
endforeach()
file(GLOB_RECURSE configs ${prefix}/*/mumoeConfig.cmake)
if(NOT configs)
  message(FATAL_ERROR "the install holds no mumoeConfig.cmake")
endif()

build_and_run(find_package find_package uses_mumoe -DCMAKE_PREFIX_PATH=${prefix})

run("configuring the add_subdirectory project" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/add_subdirectory
    -B ${WORK_DIR}/add_subdirectory -DMUMOE_SOURCE_DIR=${MUMOE_SOURCE_DIR} -DCMAKE_CXX_COMPILER=${CXX}
    -DMUMOE_CUDA=OFF -DUSER_BUILD_TYPE=)
run("configuring the FetchContent project" ${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/fetchcontent
    -B ${WORK_DIR}/fetchcontent -DMUMOE_SOURCE_DIR=${MUMOE_SOURCE_DIR} -DCMAKE_CXX_COMPILER=${CXX}
    -DMUMOE_CUDA=OFF -DCMAKE_BUILD_TYPE=Release)
message(STATUS "find_package(mumoe), add_subdirectory(mumoe) and FetchContent(mumoe) work")
