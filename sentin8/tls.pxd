# C layout of the server contexts' callbacks (Cython pure-Python mode; tls.py stays the source): OpenSSL calls
# _c_on_servername and _c_on_alpn itself, and the servername callback swaps the connection's context through the
# C pointers below, not through cffi (tls.py, "if cython.compiled").
from sentin8.tls_connection cimport c_address
ctypedef const char *(*_servername_fn)(void *, int) noexcept nogil  # SSL_get_servername
ctypedef void *(*_set_ctx_fn)(void *, void *) noexcept nogil  # SSL_set_SSL_CTX
cdef _servername_fn c_SSL_get_servername
cdef _set_ctx_fn c_SSL_set_SSL_CTX

cdef int _c_on_servername(void *ssl, int *alert, void *arg) noexcept with gil
cdef int _c_on_alpn(void *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *wire,
                    unsigned int wire_len, void *arg) noexcept with gil
