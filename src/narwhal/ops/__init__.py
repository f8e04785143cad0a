"""Operations: what an operator does to a running router and what it answers with.

The router's own admit-or-not state (`state`), the fleet's membership while it runs
(`membership`), configuration reload and what a reload may change (`reload`,
`config_changes`), drains and maintenance waves set through the admin routes
(`operator_state`), and the shutdown sequence with its drain deadline (`shutdown`,
`drain`). DESIGN.md §2: operations live in a package of their own.
"""
