// safetensors: the reader (read-only mmap, zero-copy typed views, converting accessors), the writer and the
// sharded-checkpoint index (`model.safetensors.index.json`), each in its own header; this one includes all three.
#pragma once

#include "hymix/io/safetensors_index.hpp"
#include "hymix/io/safetensors_reader.hpp"
#include "hymix/io/safetensors_writer.hpp"
