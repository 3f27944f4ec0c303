// A GnuTLS view of a string's bytes (GnuTLS takes non-const pointers but does not write them).
#pragma once

#include <gnutls/gnutls.h>

#include <string>

namespace specula {

inline gnutls_datum_t GnutlsDatum(const std::string& s) {
  return gnutls_datum_t{reinterpret_cast<unsigned char*>(const_cast<char*>(s.data())),
                        static_cast<unsigned>(s.size())};
}

}  // namespace specula
