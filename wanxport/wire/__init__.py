"""wanxport.wire layer (see docs/design.md section 2)."""
