# C layout of the per-record OpenSSL calls (Cython pure-Python mode; tls_connection.py stays the source): the TLS
# layer holds its RecordIO typed (workers/tls_layer.pxd), so each read, write, feed and drain is a C call, and
# those call OpenSSL through the C pointers below, not through cffi (tls_connection.py, "if cython.compiled").
from sentin8.key_shares cimport release_at  # once per completed handshake: a C call
ctypedef int (*_rw_fn)(void *, void *, int) noexcept nogil  # SSL_read, SSL_write, BIO_read, BIO_write
ctypedef int (*_error_fn)(void *, int) noexcept nogil  # SSL_get_error
cdef _rw_fn c_SSL_read, c_SSL_write, c_BIO_read, c_BIO_write
cdef _error_fn c_SSL_get_error
# once per handshake step or connection: the step itself, a new connection's set-up, what it is asked
ctypedef int (*_ssl_fn)(void *) noexcept nogil  # SSL_do_handshake
ctypedef long (*_mem_data_fn)(void *, char **) noexcept nogil  # BIO_get_mem_data
ctypedef const char *(*_servername_fn)(void *, int) noexcept nogil  # SSL_get_servername
ctypedef void (*_free_fn)(void *) noexcept nogil  # X509_free, SSL_free
ctypedef const char *(*_version_fn)(void *) noexcept nogil  # SSL_get_version
ctypedef void (*_alpn_fn)(void *, unsigned char **, unsigned int *) noexcept nogil  # SSL_get0_alpn_selected
ctypedef void *(*_peer_cert_fn)(void *) noexcept nogil  # SSL_get_peer_certificate, SSL_new, BIO_new
ctypedef int (*_bio_free_fn)(void *) noexcept nogil  # BIO_free
ctypedef void (*_set_bio_fn)(void *, void *, void *) noexcept nogil  # SSL_set_bio
ctypedef long (*_set_mode_fn)(void *, long) noexcept nogil  # SSL_set_mode (cffi's wrapper of the macro)
cdef _ssl_fn c_SSL_do_handshake
cdef _mem_data_fn c_BIO_get_mem_data
cdef _servername_fn c_SSL_get_servername
cdef _free_fn c_X509_free, c_SSL_free, c_SSL_set_accept_state
cdef _peer_cert_fn c_SSL_new, c_BIO_new
cdef _bio_free_fn c_BIO_free
cdef _set_bio_fn c_SSL_set_bio
cdef _set_mode_fn c_SSL_set_mode
cdef void *c_mem_method
cdef _version_fn c_SSL_get_version
cdef _ssl_fn c_SSL_session_reused
cdef _alpn_fn c_SSL_get0_alpn_selected
cdef _peer_cert_fn c_SSL_get_peer_certificate
cdef char c_scratch[65536]  # _SCRATCH bytes (checked at import)
cdef Py_ssize_t _SCRATCH, _RENEW_ABOVE

cpdef size_t c_address(object cdata) except? 0  # tls.py calls it too

cdef class RecordIO:
    cdef public object _owner, _ssl, _into, _from
    cdef public bint _fed_big
    cdef void *_c_ssl
    cdef void *_c_into
    cdef void *_c_from
    cpdef handshake(self)
    cpdef feed(self, data)
    cpdef read(self)
    cpdef write(self, data)
    cpdef drain(self)
    cpdef bytes _read_out(self)
    cpdef shutdown(self)
    cpdef _renew_out(self)
    cpdef _renew_into(self)
    cpdef _point(self)

cpdef object _scratch()  # twice per request in the pure build: a C call from RecordIO

cdef void *_ssl_pointer(object conn) except NULL
cdef RecordIO _accepting_c(type cls, object context)
