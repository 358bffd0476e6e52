// Two libraries that define the same symbol, for the RTLD_NEXT test (rtld_next.cpp).
extern "C" __attribute__((visibility("default"))) const char* which_lib() { return "a"; }
// Referenced by rtld_next so that the link keeps next_a (--as-needed) ahead of next_b.
extern "C" __attribute__((visibility("default"))) int a_only() { return 1; }
