# C layout of the key shares' release (Cython pure-Python mode; key_shares.py stays the source): once per
# completed handshake, two SSL_ctrl and up to four EVP_PKEY_free calls through the C pointers below, not cffi.
ctypedef long (*_ctrl_fn)(void *, int, long, void *) noexcept nogil  # SSL_ctrl
ctypedef void (*_free_fn)(void *) noexcept nogil  # EVP_PKEY_free
cdef _ctrl_fn c_SSL_ctrl
cdef _free_fn c_EVP_PKEY_free

cdef class KeyShares:
    cdef public bint usable
    cdef public dict slots
    cdef public object ctrl, free
    cpdef bint release(self, size_t ssl, int ctrl) except? -1
    cdef size_t _key(self, size_t ssl, int ctrl) except? 0
    cdef int _free(self, size_t key) except -1

cdef bint take_word(size_t address, size_t expected)
cpdef Py_ssize_t release_at(size_t ssl) except -1
