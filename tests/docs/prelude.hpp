// The prelude of the C++ fragments and declaration blocks of README.md and docs/*.md (cmake/doc_snippets.cmake
// compiles every block). A fragment is compiled inside a function body after this header, its own #include lines
// moved in front of the function; it may use the variables below as if the surrounding program had declared them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <hymix/core/tensor.hpp>
#include <hymix/stack/model.hpp>

hymix::stack_config cfg;          // a stack's sizes (docs/building_stacks.md)
hymix::stack_weights weights;     // its embedding [V, d], final norm [d] and LM head [V, d]
std::vector<std::int32_t> prompt;  // token ids
std::vector<std::int32_t> ids;     // token ids
