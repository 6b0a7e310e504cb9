// peakbound errors. Every error a user can cause or act on is a peakbound::Error
// (or a subclass); the CLI prints what() as one line and exits non-zero.
// Broken internal invariants use PB_CHECK, which names file and line.
#pragma once

#include <stdexcept>
#include <string>

namespace peakbound {

// `message` with every control character written as an escape ("\n", "\t", "\x01"): a
// value quoted from a file or a flag (a JSON string holding a newline, say) cannot split
// the line.
std::string one_line(const std::string& message);

// Base of all peakbound errors; what() is one line a user can act on (one_line above).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(one_line(message)) {}
};

// A user-supplied value (flag, config field, size string) is invalid.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A memory budget (device Arena or host ledger) cannot satisfy a request.
class OutOfBudget : public Error {
 public:
  using Error::Error;
};

// A communicator call failed (MPI error, mismatched sizes).
class CommError : public Error {
 public:
  using Error::Error;
};

// A feature was not compiled in or not yet implemented.
class Unavailable : public Error {
 public:
  using Error::Error;
};

// Training met a non-finite loss or gradient; every rank throws the same message
// (the CLI prints it once).
class NonFinite : public Error {
 public:
  using Error::Error;
};

// A failure every rank of the job knows of, with the same message (one rank may have
// seen it first; see agree() in comm/agree.h): the CLI prints it once, from rank 0, and
// every rank exits non-zero without aborting the job.
class AgreedError : public Error {
 public:
  using Error::Error;
};

// An internal invariant does not hold: a bug in peakbound, not in the input.
class InternalError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void throw_internal(const char* file, int line, const char* cond,
                                 const std::string& detail);

}  // namespace peakbound

// PB_CHECK(cond) << nothing: use PB_CHECK_MSG for context. Always on (cheap).
#define PB_CHECK(cond) \
  do { if (!(cond)) ::peakbound::throw_internal(__FILE__, __LINE__, #cond, ""); } while (0)
#define PB_CHECK_MSG(cond, msg) \
  do { if (!(cond)) ::peakbound::throw_internal(__FILE__, __LINE__, #cond, (msg)); } while (0)
