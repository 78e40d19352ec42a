"""wanxport.core layer (see docs/design.md section 2)."""
