# Sourced by the scripts of scripts/dev that run on the device machine, which has no network: unpacks the Debian
# packages carried in .debs/ (Eigen, xsimd, oneTBB, Google Benchmark, nlohmann-json, CLI11, fmt) into /tmp/deps and
# points CMake, the compiler and the loader at them.
#   source scripts/dev/offline_deps.sh
mkdir -p /tmp/deps && for d in .debs/*.deb; do dpkg -x "$d" /tmp/deps; done
export CMAKE_PREFIX_PATH=/tmp/deps/usr CPATH=/tmp/deps/usr/include LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu
