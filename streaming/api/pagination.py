"""Page numbers for every list of the REST API."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import PageNumberPagination

# A page number longer than this is past any list (and ``int`` of a huge string is slow).
MAX_PAGE_DIGITS = 9


class PageNumbers(PageNumberPagination):
    """DRF's page numbers, where a ``page`` that is not a page number (``0``, ``-1``,
    ``abc``, ``1.5``) is a 400 naming it, as every other bad query parameter is; DRF
    answers it 404 "Invalid page.", which reads as "no such list". A page past the last
    stays DRF's 404."""

    def get_page_number(self, request: Any, paginator: Any) -> Any:
        raw = request.query_params.get(self.page_query_param)
        if raw is not None and raw not in self.last_page_strings:
            significant = raw.lstrip("0")
            if not (raw.isascii() and raw.isdigit() and significant):
                raise ValidationError({self.page_query_param: "must be a positive integer"})
            if len(significant) > MAX_PAGE_DIGITS:
                # A page number, past the last page of any list: DRF's answer to one.
                raise NotFound(self.invalid_page_message.format(page_number=raw, message=""))
        return super().get_page_number(request, paginator)
