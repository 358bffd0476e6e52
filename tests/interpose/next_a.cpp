// Two libraries that define the same symbol, for the RTLD_NEXT test (rtld_next.cpp).
extern "C" __attribute__((visibility("default"))) const char* which_lib() { return "a"; }
