# C layout of the ticket sealer (Cython pure-Python mode; session_tickets.py stays the source): OpenSSL calls
# _c_on_ticket itself, and the callback calls OpenSSL through the C pointers below, not through cffi (no
# closure entry, no argument conversion, no GIL hand-off per call; session_tickets.py, "if cython.compiled").
from libc.string cimport memcpy
from sentin8.ticketkeys cimport TicketKeyRing  # keys() and lookup() per handshake: C calls

ctypedef int (*_cipher_init_fn)(void *, void *, void *, const unsigned char *, const unsigned char *) noexcept nogil
ctypedef int (*_mac_params_fn)(void *, void *) noexcept nogil  # EVP_MAC_CTX_set_params
ctypedef int (*_rand_fn)(unsigned char *, int) noexcept nogil  # RAND_bytes
ctypedef void *(*_get_ctx_fn)(void *) noexcept nogil  # SSL_get_SSL_CTX
ctypedef void *(*_get_ex_fn)(void *, int) noexcept nogil  # SSL_CTX_get_ex_data
cdef _cipher_init_fn c_encrypt_init, c_decrypt_init
cdef _mac_params_fn c_mac_set_params
cdef _rand_fn c_rand_bytes
cdef _get_ctx_fn c_get_ctx
cdef _get_ex_fn c_get_ex_data
cdef void *c_cipher
cdef int c_ex_index

cdef size_t _address(object cdata) except? 0
cdef size_t _at(dict addresses, str name) except? 0

cdef class TicketSealer:
    cdef public TicketKeyRing ring
    cdef public object _fns, _callback
    cdef public int _ex_index
    cdef public bytes _digest
    cdef public dict _params
    cdef public Py_ssize_t sealed, opened_current, opened_previous, unknown, errors
    cdef size_t _mac_address(self, key) except? 0
    cdef tuple _build_mac_params(self, key)
    cdef int _on_ticket(self, void *ssl, unsigned char *key_name, unsigned char *iv, void *cipher, void *mac,
                        int enc) noexcept
    cdef int _seal_setup(self, unsigned char *key_name, unsigned char *iv, key) except? -9
    cdef int _cipher_init(self, void *cipher, key, unsigned char *iv, bint seal) except? -9
    cdef int _mac_init(self, void *mac, key) except? -9
    cdef bytes _name_of(self, unsigned char *key_name)

cdef int _c_on_ticket(void *ssl, unsigned char *key_name, unsigned char *iv, void *cipher, void *mac,
                      int enc) noexcept with gil
