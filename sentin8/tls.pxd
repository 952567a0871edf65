# C layout of the per-record OpenSSL calls (Cython pure-Python mode; tls.py stays the source): the TLS layer
# holds its RecordIO typed (workers/tls_layer.pxd), so each read, write, feed and drain is a C call, and those
# call OpenSSL through the C pointers below, not through cffi (tls.py, "if cython.compiled").
ctypedef int (*_rw_fn)(void *, void *, int) noexcept nogil  # SSL_read, SSL_write, BIO_read, BIO_write
ctypedef int (*_error_fn)(void *, int) noexcept nogil  # SSL_get_error
cdef _rw_fn c_SSL_read, c_SSL_write, c_BIO_read, c_BIO_write
cdef _error_fn c_SSL_get_error
cdef char c_scratch[65536]  # _SCRATCH bytes (checked at import)
cdef Py_ssize_t _SCRATCH, _RENEW_ABOVE

cdef size_t _c_address(object cdata) except? 0

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
