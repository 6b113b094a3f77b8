"""Felb-MU: Felb with Lee-Seung multiplicative step sizes (the Felb paper, Sec. 3.1).

The step-size matrices eta_U = U / (U V V^T) and eta_V = V / (U^T U V) replace Felb's
Lipschitz steps 1/||V V^T||_2 and 1/||U^T U||_2 in eq. 8; everything else (the Elb prox,
the proximity prox, iPALM inertia, lambda_t, the server's proximal aggregation) is
:mod:`algorithms.felb`. The registry maps ``felb-mu`` here.
"""

from algorithms.felb import FELB_MU as ALGORITHM
from algorithms.felb import FelbMUConfig

__all__ = ["ALGORITHM", "FelbMUConfig"]
