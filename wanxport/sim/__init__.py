"""wanxport.sim layer (see DESIGN.md section 2)."""
