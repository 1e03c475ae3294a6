# Third-party libraries, all from Debian's packages (deploy/install-deps.sh installs them).
# One imported target per library; modules link these names and nothing else.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
add_library(ember::xxhash UNKNOWN IMPORTED)
set_target_properties(ember::xxhash PROPERTIES IMPORTED_LOCATION ${XXHASH_LIBRARY}
                      INTERFACE_INCLUDE_DIRECTORIES ${XXHASH_INCLUDE_DIR})

pkg_check_modules(CMOCKA IMPORTED_TARGET cmocka)

pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)

pkg_check_modules(ROCKSDB REQUIRED IMPORTED_TARGET rocksdb)
pkg_check_modules(LIBUV REQUIRED IMPORTED_TARGET libuv)
# TLS of the data plane (common/pc_tls.c); gRPC brings its own.
pkg_check_modules(OPENSSL REQUIRED IMPORTED_TARGET openssl)
pkg_check_modules(HIREDIS REQUIRED IMPORTED_TARGET hiredis)
pkg_check_modules(GRPC REQUIRED IMPORTED_TARGET grpc gpr)
pkg_check_modules(PROTOBUFC REQUIRED IMPORTED_TARGET libprotobuf-c)
find_program(PROTOC_C protoc-c REQUIRED)
pkg_check_modules(MHD REQUIRED IMPORTED_TARGET libmicrohttpd)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
# psctl plot: training curves (svg and pngcairo drivers: plplot-driver-cairo).
pkg_check_modules(PLPLOT REQUIRED IMPORTED_TARGET plplot)
