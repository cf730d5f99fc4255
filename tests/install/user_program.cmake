# The user's program of the add_subdirectory and FetchContent projects (tests/install/*),
# included after mumoe has been added: one executable named after the project, linking
# mumoe::mumoe, and a check that mumoe brought none of its own tests or programs along.
add_executable(${PROJECT_NAME} ${CMAKE_CURRENT_LIST_DIR}/find_package/main.cpp)
target_link_libraries(${PROJECT_NAME} PRIVATE mumoe::mumoe)
foreach(t test_tensor demo_fmnist hierarchical_trmumoe)
  if(TARGET ${t})
    message(FATAL_ERROR "${PROJECT_NAME}: adding mumoe added its own target ${t}")
  endif()
endforeach()
