"""wanxport.sim layer (see docs/design.md section 2)."""
