# Links gRPC, protobuf, abseil, yaml-cpp and their C dependencies statically (Debian ships the
# .a files next to the .so). Every `shoal` command starts a fresh process, and `shoal run`
# starts three (client, master, agent): with ~60 shared libraries each start cost ~15 ms of
# mapping and relocation, most of Shoal's launch overhead. All of the gRPC/protobuf/abseil
# cluster must switch together, or protobuf's registries would exist twice.
function(shoal_prefer_static_deps)
  get_property(imported DIRECTORY "${PROJECT_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  set(switched 0)
  foreach(target IN LISTS imported)
    if(NOT target MATCHES "^(gRPC::|absl::|protobuf::libprotobuf$|re2::re2$|c-ares::cares$|yaml-cpp$|ZLIB::ZLIB$|OpenSSL::)")
      continue()
    endif()
    get_target_property(type ${target} TYPE)
    if(NOT type MATCHES "SHARED_LIBRARY|UNKNOWN_LIBRARY")
      continue()
    endif()
    foreach(prop IMPORTED_LOCATION IMPORTED_LOCATION_NONE IMPORTED_LOCATION_RELEASE IMPORTED_LOCATION_RELWITHDEBINFO)
      get_target_property(location ${target} ${prop})
      if(location AND location MATCHES "\\.so")
        string(REGEX REPLACE "\\.so(\\.[0-9.]+)?$" ".a" archive "${location}")
        if(EXISTS "${archive}")
          set_target_properties(${target} PROPERTIES ${prop} "${archive}" IMPORTED_SONAME "" IMPORTED_NO_SONAME TRUE)
          math(EXPR switched "${switched} + 1")
        endif()
      endif()
    endforeach()
  endforeach()
  message(STATUS "Shoal: ${switched} dependency libraries linked statically")
endfunction()
