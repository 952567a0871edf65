# C layout of one WAF transaction's calls (Cython pure-Python mode; waf_calls.py stays the source): the
# engine's per-transaction functions as C function pointers, taken once from the ctypes library
# (waf_calls.py, "if cython.compiled"). The types are libmodsecurity's C API (modsecurity/transaction.h,
# modsecurity/intervention.h).
ctypedef struct _intervention:  # ModSecurityIntervention
    int status
    int pause
    char *url
    char *log
    int disruptive

ctypedef void *(*_new_fn)(void *, void *, const char *, void *) noexcept nogil
ctypedef int (*_connection_fn)(void *, const char *, int, const char *, int) noexcept nogil
ctypedef int (*_uri_fn)(void *, const char *, const char *, const char *) noexcept nogil
ctypedef int (*_header_fn)(void *, const char *, size_t, const char *, size_t) noexcept nogil
ctypedef int (*_tx_fn)(void *) noexcept nogil  # the phases, logging
ctypedef int (*_body_fn)(void *, const char *, size_t) noexcept nogil
ctypedef int (*_intervention_fn)(void *, _intervention *) noexcept nogil
ctypedef void (*_intervention_cleanup_fn)(_intervention *) noexcept nogil
ctypedef size_t (*_rule_ids_fn)(void *, long long *, size_t) noexcept nogil
ctypedef void (*_cleanup_fn)(void *) noexcept nogil

cdef class Transactions:
    cdef object _lib
    cdef _new_fn _c_new
    cdef _connection_fn _c_connection
    cdef _uri_fn _c_uri
    cdef _header_fn _c_header
    cdef _tx_fn _c_headers_done, _c_body_done, _c_logging
    cdef _body_fn _c_body
    cdef _intervention_fn _c_intervention
    cdef _intervention_cleanup_fn _c_intervention_cleanup
    cdef _rule_ids_fn _c_rule_ids
    cdef _cleanup_fn _c_cleanup
    cdef _bind(self, lib)
    cpdef tuple run(self, msc, rules, bytes tx_id, req)
    cdef tuple _run_compiled(self, size_t msc, size_t rules, bytes tx_id, req)
    cdef bint _phases_compiled(self, void *tx, req, _intervention *it) except -1

cpdef list engine_headers(req)
cdef size_t _address(object function) except? 0
