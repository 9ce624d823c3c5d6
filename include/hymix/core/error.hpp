// hymix error hierarchy: every failure the library reports on bad input is one of these types.
// Messages name the file / tensor and the expected vs. found values, so callers can act on them.
#pragma once

#include <stdexcept>
#include <string>

namespace hymix {

/// Base of every error hymix throws on bad input or unsupported configuration.
struct error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Reading or writing a file failed at the OS level (missing file, permission, short write).
struct io_error : error {
    using error::error;
};

/// A file was read but its contents are malformed (safetensors header, JSON, data offsets).
struct format_error : error {
    using error::error;
};

/// A configuration is inconsistent or asks for something hymix does not support.
struct config_error : error {
    using error::error;
};

/// A tensor shape does not match what an operation expects.
struct shape_error : error {
    using error::error;
};

/// A tensor dtype does not match what an operation expects, or is unknown.
struct dtype_error : error {
    using error::error;
};

/// Input data is invalid (e.g. NaN / Inf in an input tensor, token id out of range).
struct value_error : error {
    using error::error;
};

}  // namespace hymix
