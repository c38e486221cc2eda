# Fails when a source file of one layer of src/ includes a header of a layer it
# may not use. Run by the build (the idemkafka_layers target) whenever a source
# changes; the layers and what each may use come from CMakeLists.txt:
#
#   cmake -DSRC=<repo>/src -DLAYERS="core=;pg=core,observe;..." -DSTAMP=<file> -P check_layers.cmake
#
# Headers of include/idemkafka (the public API) are allowed everywhere.
cmake_minimum_required(VERSION 3.16)
set(problems "")
foreach(entry IN LISTS LAYERS)
  string(REPLACE "=" ";" parts "${entry}")
  list(GET parts 0 layer)
  list(LENGTH parts n)
  set(allowed "")
  if(n GREATER 1)
    list(GET parts 1 uses)
    string(REPLACE "," ";" allowed "${uses}")
  endif()
  file(GLOB files "${SRC}/${layer}/*.cpp" "${SRC}/${layer}/*.hpp")
  foreach(file IN LISTS files)
    file(STRINGS "${file}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[a-z_]+/")
    foreach(line IN LISTS includes)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([a-z_]+)/.*" "\\1" used "${line}")
      if(used STREQUAL layer OR used STREQUAL "idemkafka")
        continue()
      endif()
      list(FIND allowed "${used}" at)
      if(at EQUAL -1)
        file(RELATIVE_PATH rel "${SRC}/.." "${file}")
        string(STRIP "${line}" line)
        string(APPEND problems "\n  ${rel}: ${line} (layer ${layer} may use: ${uses})")
      endif()
    endforeach()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "includes across layers that CMakeLists.txt does not allow (see CONTRIBUTING.md, "
                      "Layers):${problems}")
endif()
file(WRITE "${STAMP}" "ok\n")
