"""wanxport.gateway layer (see docs/design.md section 2)."""
