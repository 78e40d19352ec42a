"""wanxport.core layer (see DESIGN.md section 2)."""
