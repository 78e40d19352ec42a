"""wanxport.wire layer (see DESIGN.md section 2)."""
