#pragma once
// The e2e harness: real ferryd processes (daemons.hpp), what tests do as their clients
// (clients.hpp), and the daemons' info documents (info.hpp), which most e2e tests use together.

#include "clients.hpp"
#include "daemons.hpp"
#include "info.hpp"
