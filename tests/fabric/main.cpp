// Catch2 v2 entry point for the [fabric] tests.
#include "test_main.hpp"
