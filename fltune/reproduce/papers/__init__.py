"""Paper tables, one module per paper, each listing its own (``TABLES``) for ``reproduce.registry``."""
