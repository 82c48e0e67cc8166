// Catch2 v2 entry point for the [fabric] tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
