// Ecosystem (AITER) entry-point names. STUB.
#include "moekit/registry.h"
