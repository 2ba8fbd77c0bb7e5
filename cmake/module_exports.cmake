# cmake -DNM=... -DMODULE=librepipe_mpi.so -DOUT=repipe.exports -P module_exports.cmake
#
# Writes the dynamic list of the repipe command: the library's symbols that
# the MPI module calls (rp_*, rpi_*), and no others. The command holds the
# only copy of the library and the module finds those few symbols in it;
# exporting all 600 of them (ENABLE_EXPORTS) made every start of the command
# pay for a dynamic symbol table it never needs. The list is read from the
# module itself, so it cannot fall behind the module's code, and a symbol
# missing from it fails loudly: the command opens the module RTLD_NOW.
execute_process(COMMAND ${NM} -D --undefined-only ${MODULE}
                OUTPUT_VARIABLE undefined RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --undefined-only ${MODULE} failed (${rc})")
endif()
string(REGEX MATCHALL "U rpi?_[A-Za-z0-9_]+" calls "${undefined}")
list(TRANSFORM calls REPLACE "^U " "")
list(REMOVE_DUPLICATES calls)
list(SORT calls)
set(text "{\n")
foreach(symbol ${calls})
  string(APPEND text "  ${symbol};\n")
endforeach()
string(APPEND text "};\n")
# rewritten only when the list changes, so that the command is not relinked
file(WRITE ${OUT}.new "${text}")
execute_process(COMMAND ${CMAKE_COMMAND} -E copy_if_different ${OUT}.new ${OUT})
file(REMOVE ${OUT}.new)
