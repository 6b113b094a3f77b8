"""One ``APIRouter`` per resource.

Every resource route lives under :data:`API_PREFIX` (``/v1``): a later, incompatible API
gets ``/v2`` beside it. The operational routes (``/health``, ``/ready``, ``/metrics``) and
the pages (``/dashboard``, ``/docs``) stay unversioned, where probes and people look.
"""

API_PREFIX = "/v1"
