# C layout of admission's outcomes and the head it reads (Cython pure-Python mode; admission.py stays the
# source). The exchange reads every outcome's fields; admit reads ~15 fields of the head: struct members.
from sentin8.http.framing cimport RequestHead
from sentin8.http.head_writer cimport request_head
from sentin8.http.headers cimport forward_headers
from workers.l7.contract cimport L7Context
from workers.l7.downstream cimport ConnectionFacts

cdef class Refuse:
    cdef public object headers, host, service
    cdef public Py_ssize_t sidx, status
    cdef public bint keep_alive, local

cdef class Admitted:
    cdef public object corr, head_bytes, host, service
    cdef public Py_ssize_t sidx
    cdef public bint inspect

cpdef object admit(L7Context ctx, ConnectionFacts facts, RequestHead head)
