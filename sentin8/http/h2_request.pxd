# C declarations for h2_request.py (Cython pure-Python mode; the .py stays the source): an h2 request's head is
# built by framing's new_request_head, a C call as on h1.
from sentin8.http.framing cimport new_request_head
