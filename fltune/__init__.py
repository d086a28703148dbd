"""fltune: run, tune and compare federated-learning methods for non-IID data.

Rooms (data flows one way): config -> data -> engine(method) -> metrics -> tracking.
"""

__version__ = "0.1.0"
