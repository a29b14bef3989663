# troupe_module(NAME <name> [SOURCES ...] [DEPENDS ...] [INTERFACE])
# One library per module folder: target troupe_<name>, alias troupe::<name>, headers under
# <folder>/include/troupe/<name>/, CAF precompiled for compile speed.
function(troupe_module)
  cmake_parse_arguments(M "INTERFACE" "NAME" "SOURCES;DEPENDS" ${ARGN})
  set(tgt troupe_${M_NAME})
  if(M_INTERFACE)
    add_library(${tgt} INTERFACE)
    target_include_directories(${tgt} INTERFACE
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${tgt} INTERFACE ${M_DEPENDS})
  else()
    add_library(${tgt} STATIC ${M_SOURCES})
    target_include_directories(${tgt} PUBLIC
      $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    target_link_libraries(${tgt} PUBLIC ${M_DEPENDS} PRIVATE $<BUILD_INTERFACE:troupe_flags>)
    target_precompile_headers(${tgt} PRIVATE <caf/all.hpp> <nlohmann/json.hpp>)
    set_target_properties(${tgt} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  endif()
  set_target_properties(${tgt} PROPERTIES EXPORT_NAME ${M_NAME})
  add_library(troupe::${M_NAME} ALIAS ${tgt})
  if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/include)
    install(DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/include/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
endfunction()
