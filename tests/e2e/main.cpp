#include "test_main.hpp"
