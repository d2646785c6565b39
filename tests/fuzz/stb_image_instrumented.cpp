// stb_image compiled into fuzz_image itself, with the sanitizers and libFuzzer's coverage
// instrumentation: Debian's libstb.so is neither, so bugs inside the decoders would go unseen
// and the fuzzer would get no feedback from them. The definitions here win over libstb.so's
// for the whole executable (the static link resolves liblinea.a's calls to them first), so
// nn/readers.cpp decodes through this copy. The header is the one the library is built against.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
